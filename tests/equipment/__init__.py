"""Test equipment: simulators and helpers the tests drive, clearly not product code."""
