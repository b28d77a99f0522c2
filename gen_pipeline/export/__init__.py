"""`export`: committed samples → the files a trainer loads."""
