# `python3 -m unittest discover` from clients/python imports the tests as
# this package; they import their helpers as the top-level module support.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
