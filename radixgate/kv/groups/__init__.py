"""Attention groups: what each kind of attention layer needs of a sequence's blocks, behind
one interface (base.py): full attention (full.py, holds nothing) and the sliding window
(window.py, over the window layers' second pool, window_slots.py, sized by window_plan.py)."""
