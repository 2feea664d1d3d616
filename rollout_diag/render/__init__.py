"""Results -> rich tables and flat text formats. Pure functions: no printing, no torch, no file reading."""
