"""The operators' dashboard: where every stream stands."""
