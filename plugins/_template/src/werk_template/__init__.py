"""werk-template: the smallest complete Werk backend plugin (an in-process echo backend)."""
