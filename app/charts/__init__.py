"""Pure chart functions: engine events (and a few engine facts) in, a Plotly figure dict out.

Every function returns {"data": [...], "layout": {...}} built from plain lists and numbers, so it can be sent
to the browser as JSON and drawn with Plotly.react, and unit-tested without a browser.
"""
