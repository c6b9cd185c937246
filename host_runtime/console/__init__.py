"""The box's console: a UI-free data layer (data.py) read by the textual dashboard and `everycycle status`."""
