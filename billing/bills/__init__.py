"""费用中心: 账单明细 (every charge line of a month, with what vouchers, trial credit and cash paid
of it), the monthly bill by product and member, and their CSV / XLSX exports."""
