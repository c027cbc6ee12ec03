"""What simrun is measured against: the limit of this machine and the reference's ledger."""
