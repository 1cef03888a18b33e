"""esync: heterogeneity-aware distributed training on MXNet's parameter server (ESync, SSGD, ASGD, DC-ASGD)."""
