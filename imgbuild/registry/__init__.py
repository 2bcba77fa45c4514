"""The only code that speaks HTTP: the registry client (client), NGC tag listings (tags) and `imgbuild mirror`."""
