"""Read-mostly SQL for operators: inspection, parked sagas, the audit trail, checks, gauges."""
