"""Rate cards and rating: prices per flavor and priority class, and usage x rates -> lines."""
