"""The gang marks: annotation (or label) keys that make claims one all-or-nothing job.

A contract between the writers of claims (`dralloc submit --gang`, users' manifests) and
the allocator, which collects claims by them (`dralloc.allocator.engine.gang`):

    dralloc.dev/gang: <name>          # the job
    dralloc.dev/gang-size: "<N>"      # how many claims to wait for
    dralloc.dev/gang-domain: <key>    # optional: a node label key the gang shares
"""

GANG = "dralloc.dev/gang"
GANG_SIZE = "dralloc.dev/gang-size"
GANG_DOMAIN = "dralloc.dev/gang-domain"
