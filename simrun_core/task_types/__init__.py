"""The built-in task types: `command` and the demo `demo.squares`."""
