"""Real-name verification (实名认证): a person (name, ID number, face check by a provider) or an
organisation (licence reviewed by an operator), and the gate other apps call before what needs it
(``services.require_verified``). A building block of the console: it imports no app."""
