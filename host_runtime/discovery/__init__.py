"""Hardware discovery: what the box has, written as a validated topology file."""
