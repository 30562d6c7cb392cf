"""Sizes in the public values, and a config whose key and template were swapped.

``SandboxLimits`` sizes default to None (no request: E2B sizes sandboxes by template), the
handle gained optional sizes without changing how it is built or compared, and a template
that looks like an API key is refused without being shown.
"""

from __future__ import annotations

import pytest

from e2b_provider import ConfigError, DeploymentConfig, SandboxHandle, SandboxLimits
from e2b_provider.core.messages import looks_like_sandbox_id
from e2b_provider.protocol import validate as v

KEY = "e2b_" + "0123456789abcdef" * 2 + "01234567"  # e2b_ and 40 hex digits, like E2B's


def test_limits_request_no_size_by_default_and_none_is_valid() -> None:
    limits = SandboxLimits()
    assert (limits.cpu, limits.memory_mb, limits.disk_mb) == (None, None, None)
    assert v.check_limits(limits) is limits
    assert v.check_limits(SandboxLimits(cpu=2, memory_mb=None, disk_mb=512)).cpu == 2
    with pytest.raises(v.InvalidArgument, match="memory_mb must be a positive finite number"):
        v.check_limits(SandboxLimits(memory_mb=0))


def test_a_handle_with_sizes_is_built_and_compared_as_before() -> None:
    h = SandboxHandle("iabc", "job", cpu_count=2, memory_mb=512, disk_mb=1024)
    assert (h.id, h.name, h.cpu_count, h.memory_mb, h.disk_mb) == ("iabc", "job", 2, 512, 1024)
    plain = SandboxHandle("iabc", "job")  # positional id, name as before; sizes unknown
    assert (plain.cpu_count, plain.memory_mb, plain.disk_mb) == (None, None, None)
    assert plain == h and hash(plain) == hash(h) and str(h) == "iabc"
    assert {plain: 1}[h] == 1
    with pytest.raises(TypeError):
        SandboxHandle("iabc", "job", 2)  # type: ignore[misc]  # sizes are keyword-only


@pytest.mark.parametrize("template", [KEY, KEY[4:], "sk_e2b_" + KEY[4:], KEY.upper()])
def test_a_template_that_looks_like_an_api_key_is_refused_unshown(template: str) -> None:
    # DeploymentConfig(template, key): the two arguments swapped
    with pytest.raises(ConfigError) as ei:
        DeploymentConfig("base", template)
    with pytest.raises(ConfigError) as mapped:
        DeploymentConfig.from_mapping({"apiKey": "base", "template": template})
    for exc in (ei.value, mapped.value):
        texts = [str(exc), repr(exc), *exc.problems]
        assert "template: looks like an E2B API key" in str(exc)
        assert "swapped" in str(exc)
        for text in texts:
            assert template not in text and template[4:20] not in text, text


@pytest.mark.parametrize(
    "template", ["base", "e2b_code_interpreter", "rki5dems9wqfm4r03t7g", "my-team/python-3.12"]
)
def test_template_names_and_ids_are_still_taken(template: str) -> None:
    assert DeploymentConfig(KEY, template).template == template


@pytest.mark.parametrize(
    ("text", "shaped"),
    [("i4f7kq2m9x0b1c3d5e6g8", True), ("abcdefghij0123456789-6532622b", True),
     ("job-1", False), ("Job1", False), ("short", False)],
)  # fmt: skip
def test_what_an_e2b_sandbox_id_looks_like(text: str, shaped: bool) -> None:
    assert looks_like_sandbox_id(text) is shaped
