"""对公转账: a top-up by bank transfer with a remittance code, matched by an operator by hand or
from a bank statement CSV, credited exactly once through ``billing.services.confirm_payment``."""
