"""Ray plumbing every role shares: placement groups, bounded calls, rendezvous."""
