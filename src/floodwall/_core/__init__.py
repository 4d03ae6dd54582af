"""Pure building blocks shared by every policy: clock, outcomes, windows, events, errors."""
