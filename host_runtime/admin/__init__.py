"""What the box's owner does to a running box, shared by the CLI (`everycycle models`) and the console's models
screen: make a store model the one serving starts with, remove one the service may be serving, each with the
services told. Above the store (models), the engine pool and serving, whose pieces it joins."""
