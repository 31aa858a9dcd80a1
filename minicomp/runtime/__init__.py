"""The runtime: execution plans of kernel launches and ATen calls over a planned workspace."""
