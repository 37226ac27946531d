// Placeholder: tests being written.
