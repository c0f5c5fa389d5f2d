"""The built-in scheduling plugins, one module each; :mod:`sluicegate.builtins` registers
them. Each imports only the framework layer (:mod:`sluicegate.framework`), the data layer's
views and library code, never another plugin.

This package exports nothing (``__all__`` is empty): it is a namespace of plugin modules.
Plugins are reached by type name through the registry (``sluicegate.default_registry()``),
and a re-export here would load every plugin with any one of them.
"""

__all__: list[str] = []
