"""Lower tiers below memory behind one protocol (base.py: look up, load, spill, forget): the
tier index (index.py, torch-free) and the disk tier (disk/), the first implementation."""
