"""What every world of esync shares: errors, atomic files, argument types, the run layout, the
modes table, process and network-interface helpers. Plain Python: no MXNet, no Django."""
