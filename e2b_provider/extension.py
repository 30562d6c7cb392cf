"""The platform extension object: registers the provider under the name ``sandbox-e2b``.

The reference plugin registers itself with its platform through ``defineExtension``. This
module is the Python equivalent: a plain value that a host application discovers through the
``e2b_provider.extensions`` entry point (or imports directly) and calls ``setup`` on with its
deployment configuration. Direct use needs none of it: ``E2BSandboxProvider(config)``.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Union

import attrs

from ._version import __version__
from .config import EXTENSION_NAME, DeploymentConfig, config_schema
from .provider import E2BSandboxProvider

__all__ = ["Extension", "extension"]


@attrs.frozen
class Extension:
    """A sandbox-provider extension: name, version, config schema and a factory.

    Attributes:
        name: ``"sandbox-e2b"``.
        version: the package version.
        provides: the extension points it provides (``("sandbox",)``).
        config_schema: a JSON-schema-like description of the deployment config
            (``apiKey`` is marked secret).
        factory: builds the provider from a validated config.
    """

    name: str
    version: str
    provides: tuple[str, ...]
    config_schema: Dict[str, Any]
    factory: Callable[[DeploymentConfig], E2BSandboxProvider] = attrs.field(repr=False)

    def setup(self, config: Union[DeploymentConfig, Mapping[str, Any]]) -> E2BSandboxProvider:
        """Validate ``config`` (a DeploymentConfig or a camelCase/snake_case mapping) and build
        the provider."""
        if not isinstance(config, DeploymentConfig):
            config = DeploymentConfig.from_mapping(config)
        return self.factory(config)


extension = Extension(
    name=EXTENSION_NAME,
    version=__version__,
    provides=("sandbox",),
    config_schema=config_schema(),
    factory=E2BSandboxProvider,
)
