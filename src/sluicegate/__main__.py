"""``python -m sluicegate``: the same as the ``sluicegate`` command."""

from sluicegate.cli import main

main()
