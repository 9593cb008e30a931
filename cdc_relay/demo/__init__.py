"""The demo's parts: the sample traffic (``traffic``) and the live line and summary
(``report``); app/demo.py runs them."""
