"""The reference snapshot: everything the gates need from the reference, computed once, stored
content-addressed and reused by every candidate (`compact` the stored form and the figures from
it, `store` the files, `engine` the reference as the gates see it)."""
