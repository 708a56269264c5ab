//! Services plugged into rdmactor.
