"""The web door: the pages (views), their forms, the cart kept in the session, the template context
of every page, URL converters and the password rules of sign-up."""
