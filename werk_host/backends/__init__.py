"""Host-side machinery shared by backend plugins that manage native child processes."""
