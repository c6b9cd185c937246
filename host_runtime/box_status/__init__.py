"""The box's status as typed rows, read from what its services publish (never from hardware): the UI-free data
layer that the console's dashboard, `everycycle status` and the update's health gate consume."""
