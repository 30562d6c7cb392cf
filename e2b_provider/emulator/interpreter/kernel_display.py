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
from typing import Any, Callable, Dict, Optional, Tuple, Union

from IPython import get_ipython
from IPython.core.formatters import BaseFormatter, JSONFormatter


def _plain(value: Any) -> Any:
    """A DataFrame cell as JSON can carry it (timestamps as ISO text)."""
    return value.isoformat() if hasattr(value, "isoformat") else value


def _data_frame_columns(frame: Any) -> Dict[str, Any]:
    """``e2b/data``: a DataFrame as ``{column: [values]}``."""
    columns = frame.to_dict(orient="list")
    return {str(k): [_plain(v) for v in values] for k, values in columns.items()}


def _chart_data(figure: Any) -> Dict[str, Any]:
    """``e2b/chart``: a matplotlib figure as E2B's chart data (``e2b_charts``)."""
    try:
        from e2b_charts import chart_figure_to_dict

        result: Dict[str, Any] = chart_figure_to_dict(figure)
        return result
    except Exception:  # a figure the extractor cannot read is still shown as an image
        return {}


class LibraryObjectFormatter(BaseFormatter):  # type: ignore[misc]
    """A display format for the objects of one class of a library, looked for only once the
    code imported that library; any other object gets Jupyter's own handling of the format
    (an object's ``print_method``)."""

    _return_type = (dict, str)

    def __init__(
        self,
        module_name: str,
        class_name: str,
        convert: Callable[[Any], Dict[str, Any]],
        **traits: Any,
    ) -> None:
        super().__init__(**traits)
        self._module_name = module_name
        self._class_name = class_name
        self._convert = convert

    def __call__(self, obj: Any) -> Any:
        module = sys.modules.get(self._module_name)
        if module is None or not isinstance(obj, getattr(module, self._class_name)):
            return super().__call__(obj)
        return self._convert(obj)


#: The formats beyond Jupyter's own: the MIME type, the method an object may give it by, the
#: module and class whose objects are converted to it, and the conversion.
_LIBRARY_FORMATS: Tuple[Tuple[str, str, str, str, Callable[[Any], Dict[str, Any]]], ...] = (
    ("e2b/data", "_repr_e2b_data_", "pandas", "DataFrame", _data_frame_columns),
    ("e2b/chart", "_repr_e2b_chart_", "matplotlib.figure", "Figure", _chart_data),
)


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
    for mime, print_method, module_name, class_name, convert in _LIBRARY_FORMATS:
        formatters[mime] = LibraryObjectFormatter(
            module_name,
            class_name,
            convert,
            parent=parent,
            format_type=mime,
            print_method=print_method,
        )
    formatters["application/json"] = PlainJSONFormatter(parent=parent)


_shell = get_ipython()
if _shell is not None:
    install(_shell)
