"""Operator services: retry a parked saga, list deadlines, sagas by state, draw a machine.

Each service takes the store it reads (a port of `processor.ports`) and returns plain data; the
command line (`processor.cli`) opens the stores and prints the results.
"""
