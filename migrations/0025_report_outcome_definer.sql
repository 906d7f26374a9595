-- qbridge.report_outcome is how a fleet's SQL reporting records an outcome.
-- It runs with its owner's rights (SECURITY DEFINER), so a role allowed to
-- call it needs no privilege on any table: sql/roles.sql's qbridge_reporter
-- can record outcomes and read or change nothing else (before, SQL
-- reporting needed qbridge_runtime, which has full DML on the schema). Its
-- search_path is fixed, as a definer function's must be, so a caller's
-- objects cannot stand in for qbridge's. PostgreSQL lets everyone execute a
-- new function: only the roles granted it may call this one.
ALTER FUNCTION qbridge.report_outcome(text, text, text, text)
    SECURITY DEFINER SET search_path = qbridge, pg_temp;
REVOKE EXECUTE ON FUNCTION qbridge.report_outcome(text, text, text, text) FROM PUBLIC;
