"""Portal views: thin. Reads go through selectors and `tenants.access`, writes through services."""
