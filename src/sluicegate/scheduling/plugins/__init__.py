"""The built-in scheduling plugins, one module each; :mod:`sluicegate.builtins` registers
them. Each imports only the framework layer (:mod:`sluicegate.framework`), the data layer's
views and library code, never another plugin."""
