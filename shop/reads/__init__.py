"""The shop's reads (the writes are in shop.services): selectors, and the receipt a buyer is shown."""
