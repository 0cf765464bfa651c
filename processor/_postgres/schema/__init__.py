"""The processor's tables and their migrations, on plain PostgreSQL and on Citus.

``tables`` names the tables and renders statements over them, ``ddl`` holds the numbered
migrations, ``runner`` applies them once each under an advisory lock, ``participant`` holds a
participant service's tables; ``citus`` and ``citus_move`` place the schema on a Citus cluster.
"""
