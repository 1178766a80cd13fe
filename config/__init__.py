"""The site's configuration: loading with its bounds, the schema and every section."""
