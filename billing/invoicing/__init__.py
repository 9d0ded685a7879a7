"""发票: electronic invoices for consumed cash (models, services, the PDF), and the bill exports."""
