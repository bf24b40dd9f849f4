"""Drop-in adapters that let code written against other transfer engines run on TENT.

- `tent_core.compat.mooncake.TransferEngine`: Mooncake Transfer Engine's Python API
  (``from mooncake.engine import TransferEngine``; the opt-in distribution in
  ``compat/mooncake-shim`` makes that import resolve here).
"""
