"""Teams as customers use them (issue 30): create, invite, accept, leave, remove, roles,
transfer ownership, per-member budgets and card quotas."""
