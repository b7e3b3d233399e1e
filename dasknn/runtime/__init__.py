"""What every parallel mode shares: key names, measured transfers, collectives as task graphs."""
