"""vtrain's protocol side: contract compilation, chain clients, agents and the CLI.

Imports `vtrain` (training produces artifacts); `vtrain` never imports this package.
"""
