"""Lower tiers below memory: the tier index (torch-free) and the disk tier."""
