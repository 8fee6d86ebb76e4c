"""Command-line interface: one module per subcommand; main.py only registers them."""
