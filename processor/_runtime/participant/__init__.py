"""A participant service's loops (``service``) and its HTTP endpoint (``observe``)."""
