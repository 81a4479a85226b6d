"""werk-template: the smallest complete Werk backend plugin, to copy (README.md).

COPIERS: this package is ``werk_template``, the entry point and backend id ``template``; rename
all three to your one name (``mv src/werk_template src/werk_NAME``).
"""
