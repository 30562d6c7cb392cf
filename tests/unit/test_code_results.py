"""The code interpreter's values: built from wire events, shown in IPython, short reprs."""

from __future__ import annotations

import base64

import pytest

from e2b_provider.errors import ProtocolError
from e2b_provider.interpreter.results import (
    Execution,
    ExecutionError,
    Result,
    error_from_event,
    result_from_event,
    strip_ansi,
)
from e2b_provider.protocol.code_output import CodeError, CodeResult

_PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 40


def test_images_arrive_as_bytes_and_display_as_base64_again() -> None:
    wire = base64.b64encode(_PNG).decode()
    result = result_from_event(
        CodeResult(fields={"png": wire, "text": "<Figure>"}, extra={}, is_main=False)
    )
    assert result.png == _PNG
    assert result.formats() == ("text", "png")
    bundle = result._repr_mimebundle_()
    assert bundle["image/png"] == wire
    assert bundle["text/plain"] == "<Figure>"
    assert result._repr_mimebundle_(include=["image/png"]) == {"image/png": wire}
    assert "image/png" not in result._repr_mimebundle_(exclude=["image/png"])


def test_a_result_repr_never_holds_its_data() -> None:
    wire = base64.b64encode(_PNG).decode()
    result = result_from_event(CodeResult(fields={"png": wire}, extra={}, is_main=False))
    assert len(repr(result)) < 80
    assert repr(result) == "Result(formats=('png',))"
    long = Result(text="x" * 10_000, is_main_result=True)
    assert len(repr(long)) < 120 and "main" in repr(long)


@pytest.mark.parametrize(
    "fields",
    [{"png": "not base64!"}, {"png": 5}, {"html": 5}, {"chart": "line"}, {"jpeg": "é"}],
)
def test_bad_fields_are_protocol_errors(fields: dict) -> None:
    with pytest.raises(ProtocolError):
        result_from_event(CodeResult(fields=fields, extra={}, is_main=False))


def test_extra_mime_types_are_kept_and_displayed() -> None:
    result = result_from_event(
        CodeResult(fields={}, extra={"application/vnd.custom": "v"}, is_main=True)
    )
    assert result.formats() == ("application/vnd.custom",)
    bundle = result._repr_mimebundle_()
    assert bundle["application/vnd.custom"] == "v"
    assert bundle["text/plain"] == repr(result)


def test_execution_text_is_the_main_results() -> None:
    shown = Result(text="<Figure>", png=_PNG)
    value = Result(text="2", is_main_result=True)
    assert Execution(results=(shown, value)).text == "2"
    assert Execution(results=(shown,)).text is None


def test_execution_displays_streams_images_and_the_error() -> None:
    error = error_from_event(
        CodeError("ValueError", "bad <x>", "\x1b[0;31mValueError\x1b[0m: bad <x>")
    )
    run = Execution(
        results=(Result(png=_PNG), Result(text="'a' & 'b'", is_main_result=True)),
        stdout="line <1>\n",
        error=error,
        execution_count=4,
    )
    bundle = run._repr_mimebundle_()
    page = bundle["text/html"]
    assert "<pre>line &lt;1&gt;\n</pre>" in page
    assert f"data:image/png;base64,{base64.b64encode(_PNG).decode()}" in page
    assert "&#x27;a&#x27; &amp; &#x27;b&#x27;" in page
    assert "ValueError: bad &lt;x&gt;" in page and "\x1b" not in page
    assert bundle["text/plain"].splitlines()[0] == "line <1>"
    assert not run.ok
    assert str(error) == "ValueError: bad <x>"


def test_execution_repr_is_one_short_line() -> None:
    run = Execution(
        results=(Result(text="2", is_main_result=True),),
        stdout="x" * 5000,
        execution_count=1,
        timed_out=True,
    )
    text = repr(run)
    assert "\n" not in text and len(text) < 200
    assert "timed_out=True" in text and "text='2'" in text


def test_strip_ansi() -> None:
    assert strip_ansi("\x1b[0;31mKeyError\x1b[0m: 'k'") == "KeyError: 'k'"
    assert ExecutionError("A", "b", "").traceback == ""


def test_a_bundle_a_notebook_can_save() -> None:
    """nbformat keeps an object only under a JSON MIME type: E2B's data and chart go under
    ``application/vnd.e2b.*+json``, an extra type whose value is no text is left out."""
    import nbformat

    result = Result(text="t", data={"a": [1, 2]}, chart={"type": "line"}, is_main_result=True,
                    extra={"application/x-thing": {"k": 1}, "text/x-note": "n",
                           "application/vnd.x+json": {"j": 2}})
    bundle = result._repr_mimebundle_()
    assert bundle["application/vnd.e2b.data+json"] == {"a": [1, 2]}
    assert bundle["application/vnd.e2b.chart+json"] == {"type": "line"}
    assert "application/x-thing" not in bundle
    assert bundle["text/x-note"] == "n" and bundle["application/vnd.x+json"] == {"j": 2}
    cell = nbformat.v4.new_code_cell("x")
    cell.outputs = [nbformat.v4.new_output("execute_result", data=bundle, execution_count=1)]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nbformat.validate(nb)  # raises for a bundle a notebook cannot save
