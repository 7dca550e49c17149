"""The ground floor: what a process of areal needs from its machine, knowing nothing of areal.

Child processes and their groups (``process``), dying with a parent (``parent_death``), who
holds a port (``ports``), where a server may listen (``bind``), a node's address (``on_node``),
the event loop (``event_loop``), the HTTP server thread (``http_server``), heap and garbage
collector tuning (``heap``, ``gc_tuning``), fast JSON (``fast_json``), line files
(``line_file``), the fault tests' crash points (``faults``) and the clock that time rules take
as a parameter (``clock``).

Its rule: it imports nothing of areal, and every room may import it.
"""
