package dev.gazette.spark;

import java.util.ArrayList;
import java.util.EnumSet;
import java.util.List;
import java.util.Map;
import java.util.Set;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.SupportsPushDownRequiredColumns;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * The lines of journal fragments, read in the JVM: the native path of the {@code gazette}
 * source (gazette_spark.read plans, this reads). Its option {@code slices} is the plan: a
 * JSON array of partitions, each a journal's consecutive pieces (see {@link Piece}). Rows
 * are (journal, offset, value) as the Python source makes them for framing=lines.
 */
public final class LinesSource implements TableProvider, DataSourceRegister {
    static final StructType SCHEMA = new StructType(new StructField[] {
        DataTypes.createStructField("journal", DataTypes.StringType, false),
        DataTypes.createStructField("offset", DataTypes.LongType, false),
        DataTypes.createStructField("value", DataTypes.StringType, false),
    });

    @Override
    public String shortName() {
        return "gazette-lines";
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return SCHEMA;
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning,
                          Map<String, String> properties) {
        return new LinesTable(schema == null ? SCHEMA : schema, properties.get("slices"));
    }

    static final class LinesTable implements Table, SupportsRead {
        private final StructType schema;
        private final String slices;

        LinesTable(StructType schema, String slices) {
            for (StructField f : schema.fields()) {
                if (SCHEMA.getFieldIndex(f.name()).isEmpty()) {
                    throw new IllegalArgumentException("gazette-lines: no column " + f.name()
                        + " (it has journal, offset, value)");
                }
            }
            if (slices == null) {
                throw new IllegalArgumentException("gazette-lines: option 'slices' (the plan) "
                    + "is missing: read through gazette_spark.read");
            }
            this.schema = schema;
            this.slices = slices;
        }

        @Override
        public String name() {
            return "gazette-lines";
        }

        @Override
        @SuppressWarnings("deprecation") // (columns() is its successor; schema() still works)
        public StructType schema() {
            return schema;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return new Builder(schema, slices);
        }
    }

    static final class Builder implements ScanBuilder, SupportsPushDownRequiredColumns {
        private StructType schema;
        private final String slices;

        Builder(StructType schema, String slices) {
            this.schema = schema;
            this.slices = slices;
        }

        @Override
        public void pruneColumns(StructType required) {
            schema = required;
        }

        @Override
        public Scan build() {
            return new LinesScan(schema, slices);
        }
    }

    static final class LinesScan implements Scan, Batch {
        private final StructType schema;
        private final String slices;

        LinesScan(StructType schema, String slices) {
            this.schema = schema;
            this.slices = slices;
        }

        @Override
        public StructType readSchema() {
            return schema;
        }

        @Override
        public Batch toBatch() {
            return this;
        }

        @Override
        public InputPartition[] planInputPartitions() {
            try {
                JsonNode doc = new ObjectMapper().readTree(slices);
                List<InputPartition> out = new ArrayList<>();
                for (JsonNode slice : doc) {
                    out.add(SlicePartition.of(slice));
                }
                return out.toArray(new InputPartition[0]);
            } catch (java.io.IOException e) {
                throw new IllegalArgumentException("gazette-lines: option 'slices' is not "
                    + "the plan's JSON: " + e.getMessage(), e);
            }
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new Factory(schema);
        }
    }

    static final class Factory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final StructType schema;

        Factory(StructType schema) {
            this.schema = schema;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            return new LinesReader((SlicePartition) partition, schema);
        }
    }
}
