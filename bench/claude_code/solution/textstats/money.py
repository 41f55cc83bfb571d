"""Amounts of money as integer cents."""


def parse_amount(text):
    """'$1,234.50' -> 123450 (cents). A leading '$' and thousands separators are allowed."""
    s = text.strip().lstrip("$").replace(",", "")
    dollars, _, cents = s.partition(".")
    return int(dollars) * 100 + int((cents + "00")[:2])


def format_cents(cents):
    """123450 -> '$1,234.50'."""
    dollars, rest = divmod(cents, 100)
    return f"${dollars:,}.{rest:02d}"
