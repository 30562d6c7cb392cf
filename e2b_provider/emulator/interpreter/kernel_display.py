"""How the template's Python kernels display things, as E2B's do: run at every kernel's start.

The server writes this file into the kernel's IPython profile (``startup/``), so it runs in
each Python kernel before any code: it adds the display formats E2B's results carry beyond
Jupyter's own: ``e2b/data`` (a pandas DataFrame as columns of values), ``e2b/chart`` (a
matplotlib figure as chart data, by ``e2b_charts``) and JSON for lists and dicts. Each
formatter looks only at objects of a library the code already imported, so ``1 + 1`` loads
nothing. Pillow's images are shown as E2B's kernels show them: once the code imports
``PIL.Image``, saving an image to a path name displays it first (a PNG result), and
``Image.show()`` displays it through Pillow's IPython viewer, starting no viewer program (a
sandbox has no display). Never imported by the library or the emulator's server.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any, Callable, Dict, Optional, Sequence, Tuple, Union

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


def _show_on_save(image_module: types.ModuleType) -> None:
    """An image saved to a path name is displayed first (``Image.show()`` saves one too)."""
    from IPython.display import display

    image_class = image_module.Image
    save = image_class.save

    def save_shown(  # Pillow names its argument "format"
        image: Any, fp: Any, format: Optional[str] = None, **options: Any  # noqa: A002
    ) -> Any:
        if isinstance(fp, str):
            display(image)
        return save(image, fp, format, **options)

    image_class.save = save_shown


def _no_viewer(show_module: types.ModuleType) -> None:
    """Pillow's viewer programs are not used: as in E2B's image, which has none of them (the
    emulator's sandboxes see the host's ``xdg-open``, which would fail without a display and
    complain in a later run's stderr), ``Image.show()`` falls to Pillow's IPython viewer,
    which displays the image (a PNG result)."""
    viewers = show_module._viewers  # Pillow's registry, in the order they are asked
    viewers[:] = [v for v in viewers if not isinstance(v, show_module.UnixViewer)]


#: What is changed in a module of Pillow as the code first imports it.
_ON_IMPORT: Dict[str, Callable[[types.ModuleType], None]] = {
    "PIL.Image": _show_on_save,
    "PIL.ImageShow": _no_viewer,
}


class _Changed(importlib.abc.Loader):
    """A module's loader, and the change made to the module once it has run."""

    def __init__(self, loader: Any, change: Callable[[types.ModuleType], None]) -> None:
        self._loader = loader
        self._change = change

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._loader.exec_module(module)
        self._change(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _ChangeOnImport(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`_ON_IMPORT` with the other finders, then has their
    loader make the change once the module ran."""

    def find_spec(
        self, fullname: str, path: Optional[Sequence[str]], target: Any = None
    ) -> Optional[importlib.machinery.ModuleSpec]:
        change = _ON_IMPORT.get(fullname)
        if change is None:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec: Optional[importlib.machinery.ModuleSpec] = find(fullname, path, target)
            if spec is None:
                continue
            if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _Changed(spec.loader, change)
            return spec
        return None


def install(shell: Any) -> None:
    """Register the formatters with the kernel's shell; change Pillow as it is imported."""
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
    for name, change in _ON_IMPORT.items():
        if name in sys.modules:
            change(sys.modules[name])
    sys.meta_path.insert(0, _ChangeOnImport())


_shell = get_ipython()
if _shell is not None:
    install(_shell)
