"""How the template's Python kernels display things, as E2B's do: run at every kernel's start.

The server writes this file into the kernel's IPython profile (``startup/``), so it runs in
each Python kernel before any code: it adds the display formats E2B's results carry beyond
Jupyter's own: ``e2b/data`` (a pandas DataFrame as columns of values), ``e2b/chart`` (a
matplotlib figure as chart data, by ``e2b_charts``) and JSON for lists and dicts. Each
formatter looks only at objects of a library the code already imported, so ``1 + 1`` loads
nothing. Never imported by the library or the emulator's server.
"""

from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Tuple, Union

from IPython import get_ipython
from IPython.core.formatters import BaseFormatter, JSONFormatter
from traitlets import ObjectName, Unicode


def _plain(value: Any) -> Any:
    """A DataFrame cell as JSON can carry it (timestamps as ISO text)."""
    return value.isoformat() if hasattr(value, "isoformat") else value


class DataFrameFormatter(BaseFormatter):  # type: ignore[misc]
    """``e2b/data``: a DataFrame as ``{column: [values]}``."""

    format_type = Unicode("e2b/data")
    print_method = ObjectName("_repr_e2b_data_")
    _return_type = (dict, str)

    def __call__(self, obj: Any) -> Any:
        pandas = sys.modules.get("pandas")
        if pandas is None or not isinstance(obj, pandas.DataFrame):
            return super().__call__(obj)
        columns = obj.to_dict(orient="list")
        return {str(k): [_plain(v) for v in values] for k, values in columns.items()}


class ChartFormatter(BaseFormatter):  # type: ignore[misc]
    """``e2b/chart``: a matplotlib figure as E2B's chart data (``e2b_charts``)."""

    format_type = Unicode("e2b/chart")
    print_method = ObjectName("_repr_e2b_chart_")
    _return_type = (dict, str)

    def __call__(self, obj: Any) -> Any:
        figure_module = sys.modules.get("matplotlib.figure")
        if figure_module is None or not isinstance(obj, figure_module.Figure):
            return super().__call__(obj)
        try:
            from e2b_charts import chart_figure_to_dict

            return chart_figure_to_dict(obj)
        except Exception:  # a figure the extractor cannot read is still shown as an image
            return {}


class PlainJSONFormatter(JSONFormatter):  # type: ignore[misc]
    """``application/json`` for lists and dicts (numpy values and non-text keys too)."""

    def __call__(self, obj: Any) -> Union[Dict[str, Any], Tuple[Any, Dict[str, Any]], None]:
        if isinstance(obj, (list, dict)):
            try:
                import orjson

                options = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
                return orjson.loads(orjson.dumps(obj, option=options)), {"expanded": True}
            except (TypeError, ImportError):
                pass
        result: Optional[Dict[str, Any]] = super().__call__(obj)
        return result


def install(shell: Any) -> None:
    """Register the formatters with the kernel's shell."""
    formatters = shell.display_formatter.formatters
    parent = shell.display_formatter
    formatters["e2b/data"] = DataFrameFormatter(parent=parent)
    formatters["e2b/chart"] = ChartFormatter(parent=parent)
    formatters["application/json"] = PlainJSONFormatter(parent=parent)


_shell = get_ipython()
if _shell is not None:
    install(_shell)
