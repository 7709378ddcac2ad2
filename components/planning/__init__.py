"""Pure planning functions: spec in, argv / config text / scripts out. No Pulumi import here."""
